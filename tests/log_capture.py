"""A mitmproxy script for the security tests (`mitmdump -s addon/toolshim.py -s tests/log_capture.py`).

It writes every record of the `toolshim` loggers (the addon's own log) to the file named by
`TOOLSHIM_LOG_CAPTURE`, one JSON object a line: the logger, the level, the message as formatted,
and the traceback when one was logged, so a test reads exactly what the addon wrote, apart from
what mitmproxy itself prints.
"""

from __future__ import annotations

import json
import logging
import os


class _Capture(logging.Handler):
    def __init__(self, path: str) -> None:
        super().__init__(logging.DEBUG)
        self.path = path
        self.setFormatter(logging.Formatter())

    def emit(self, record: logging.LogRecord) -> None:
        exc_text = self.formatter.formatException(record.exc_info) if record.exc_info else ""
        line = {"logger": record.name, "level": record.levelname, "message": record.getMessage(), "traceback": exc_text}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


_path = os.environ.get("TOOLSHIM_LOG_CAPTURE")
if _path:
    _logger = logging.getLogger("toolshim")
    if not any(isinstance(h, _Capture) for h in _logger.handlers):
        _logger.addHandler(_Capture(_path))
        _logger.setLevel(logging.DEBUG)

addons: list = []
