"""The script mitmproxy loads: `mitmdump -s addon/toolshim.py`.

The code lives in the `toolshim_core` package (`pip install -e .`); this file only builds the
addon list. mitmproxy puts this folder first on sys.path, which is why the package does not
share this file's name.
"""

import sys
from pathlib import Path

try:
    from toolshim_core.addon import ToolShim
except ImportError:  # run from a checkout that was not pip-installed
    sys.path.append(str(Path(__file__).resolve().parents[1]))
    from toolshim_core.addon import ToolShim

addons = [ToolShim()]
