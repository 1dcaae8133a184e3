"""HTTP routers, one file per resource."""
