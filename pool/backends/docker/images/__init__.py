"""The Docker backend's images: the bases a template starts from (:mod:`.bases`), the build of a
template into a snapshot image (:mod:`.builder`, a Dockerfile through the engine's builder in
:mod:`.dockerbuild`), the tags, labels and records that make an image a snapshot
(:mod:`.catalog`), and the checkpoint images one backend took (:mod:`.checkpoints`)."""
