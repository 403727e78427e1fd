"""OCI images for the local backend.

Fetch them with skopeo, read their layout, unpack their layers into store layers.
"""
