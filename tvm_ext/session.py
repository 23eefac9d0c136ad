"""Session and SessionOptions at their earlier import path (the module is ``tvm_ext.core.session``)."""
from .core.session import Session, SessionOptions  # noqa: F401
