"""Fake network servers the tests stand up: the test internet, a CA, model endpoints, origins."""
