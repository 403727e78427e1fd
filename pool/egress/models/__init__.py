"""The model gateway: model API routes an operator configures, the in-sandbox endpoint that adds
the real key outside, and the token usage it records."""
