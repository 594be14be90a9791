"""The learned difficulty router and the routing policies."""
