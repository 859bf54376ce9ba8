"""HTTP: the connection layer, routing and gates, bodies, conditions, OpenAPI."""
