"""The registry's admin commands (models, tenants, routers) and the view they are checked against."""
