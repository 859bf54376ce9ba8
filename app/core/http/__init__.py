"""HTTP: the connection layer, routing and gates, bodies, planning, conditions, OpenAPI."""
