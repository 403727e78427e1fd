"""The Docker backend's way to the engine: the SDK at the boundary (:mod:`.engine`), containers
started with the helper as PID 1 (:mod:`.containers`, :mod:`.helper` and its ``helper.c``),
commands run through that helper (:mod:`.execution`), files through the archive API
(:mod:`.files`), and what dead runs left behind (:mod:`.reaper`)."""
