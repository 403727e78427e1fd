"""The Modal backend (``backend=modal``, ``pip install 'snapgym[modal]'``): see :mod:`.backend`."""

from pool.backends.modal.backend import ModalBackend

__all__ = ["ModalBackend"]
