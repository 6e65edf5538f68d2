"""The gateways of the core modules (minions/), one per file of `sql/queries/`: each wraps its
file's named queries as typed methods (the base: minions/db/gateway.py), so the modules that use
them never see SQL or count `$n`."""
