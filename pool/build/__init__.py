"""Building a snapshot, shared by every backend: the build loop over a recipe, Dockerfile
translation, the host view and its packages, file steps, content digests and the build network."""
