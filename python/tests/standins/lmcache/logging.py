"""Stand-in of `lmcache.logging`."""
import logging as _logging


def init_logger(name: str) -> _logging.Logger:
    return _logging.getLogger(name)
