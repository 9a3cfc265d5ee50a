"""`ledgerlm`, the command line: `main` parses and dispatches; each feature's verbs are a
module here (admin, batch, capacity, fleet, ledger, loadtest, rollout, slo)."""
