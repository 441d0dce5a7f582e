"""Keeps the host views handed to gloo until gloo's threads have let go of them.

Why: in torch 2.13.0 a tensor that has a Python object takes the GIL when its C++ use
count drops from two to one (``intrusive_ptr::reset_not_null_`` calls
``TensorImpl::decref_pyobject``). A host view (:func:`torchneuron.device._core.cpu_alias`)
is made in Python, so it has one, and gloo's worker thread is usually the last owner of
a finished ``Work``: it took the GIL to free the views. When that happened as the rank's
interpreter was finalizing (its last collective finishing just as it exits), Python
ended the thread with ``pthread_exit``, whose forced unwind crossed the ``Work``'s
``noexcept`` destructor: ``terminate called without an active exception`` (SIGABRT).

So each view gets one more C++ reference, held here: gloo's threads only ever drop
it to two or more, which touches no Python object. The views are freed by the thread
that makes the next collective call (which holds the GIL) once only this module holds
them; the ones still held when the interpreter exits are left to the OS.
"""

from __future__ import annotations

import atexit
import ctypes
import threading

import torch

_lock = threading.Lock()
# (view, the view's use count when only we held it), in the order of _references.
_held: list[tuple[torch.Tensor, int]] = []
_references: object | None = None  # one C++ list holding a reference to each held view
_exit_registered = False


def _cxx_list(first: torch.Tensor) -> object:
    """A C++-side list of tensors (a TorchScript list holds its tensors in C++).

    ``torch._C.ScriptList`` is private (checked on torch 2.13.0); no public Python object
    holds a tensor by a C++ reference: ``torch.futures.Future`` holds the Python object.
    Making one costs about 10 us (it infers its element type), appending 0.3 us, so one
    list lives for the process and each view is appended to it.
    """
    return torch._C.ScriptList([first])


def hold(*views: torch.Tensor) -> None:
    """Keeps ``views`` until nothing else holds them; call before handing them to gloo."""
    global _exit_registered, _references
    with _lock:
        for view in views:
            if _references is None:
                _references = _cxx_list(view)
            else:
                _references.append(view)
            _held.append((view, view._use_count()))
        if not _exit_registered:
            atexit.register(_keep_at_exit)
            _exit_registered = True


def release_finished() -> int:
    """Frees the views nothing but this module holds any more; returns how many are left.

    Call with the GIL held from a thread that runs Python (a collective call does).
    """
    done = []
    with _lock:
        finished = [i for i, (view, alone) in enumerate(_held) if view._use_count() <= alone]
        for i in reversed(finished):  # drop the C++ reference first: the Python one still holds it
            _references.pop(i)
            done.append(_held.pop(i))
        left = len(_held)
    del done  # the finished views die here, on this thread, outside the lock
    return left


def _keep_at_exit() -> None:
    """At interpreter exit, before finalization: never frees the views gloo may still hold.

    Finalization would free ``_held`` with the module, and a gloo thread could then again
    be the last owner of a view. A reference that nothing drops keeps them to the end.
    """
    release_finished()
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_held))
    if _references is not None:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_references))
