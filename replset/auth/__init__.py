"""Authentication and authorization: SCRAM users, roles, member keyfile auth."""
