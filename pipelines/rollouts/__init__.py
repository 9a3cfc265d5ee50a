"""Rollouts: the admin commands, the controller that acts on guardrails, its analysis and the eval table."""
