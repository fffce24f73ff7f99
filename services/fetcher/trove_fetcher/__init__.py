"""The fetcher service."""

import sys

# httpx imports its command line (click, rich and pygments: ~7 MB of every pod's memory)
# whenever they are installed, and in the image they are, for the ``trove`` command. No
# pod runs it; a None in sys.modules makes that one import fail as if they were not.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
