"""Atomic files and run directories, in one namespace (``from gmts_analysis.util import io``).

The pieces live by what they own:

- :mod:`~gmts_analysis.util.files`: reading safely (regular files only, bounded JSON, JSON lines, parquet);
- :mod:`~gmts_analysis.util.atomic`: atomic writes (every file appears complete or not at all);
- :mod:`~gmts_analysis.util.ownership`: which directories are ours (markers, listings) and the output checks;
- :mod:`~gmts_analysis.util.locks`: one job at a time on one output directory;
- :mod:`~gmts_analysis.util.staging`: a directory assembled in a temporary sibling and renamed when complete.

This module re-exports their names, so ``io.atomic_write_json`` and ``from gmts_analysis.util.io import ...``
keep working.
"""

from __future__ import annotations

import os  # noqa: F401 - re-exported: callers and tests reach os through this module

from gmts_analysis.errors import GmtsError  # noqa: F401 - re-exported
from gmts_analysis.util.atomic import (  # noqa: F401 - re-exported
    _umask,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_parquet,
    atomic_write_text,
    to_json,
)
from gmts_analysis.util.files import (  # noqa: F401 - re-exported
    MAX_JSON_BYTES,
    check_regular_file,
    file_sha256,
    jsonl_objects,
    read_json,
    read_json_object,
    read_parquet,
    require_regular,
    special_kind,
)
from gmts_analysis.util.locks import LOCK_MAGIC, exclusive_lock, lock_path  # noqa: F401 - re-exported
from gmts_analysis.util.ownership import (  # noqa: F401 - re-exported
    COMPARE_ENTRIES,
    OWNER_FORMAT,
    OWNER_MARKER,
    POLICY_ENTRIES,
    RUN_ENTRIES,
    RUN_LISTING,
    check_ours,
    check_output_file,
    check_output_location,
    clean_stale_siblings,
    foreign_entries,
    fresh_sibling_name,
    is_ours,
    mark_ours,
    ours_beside,
    unmark,
)
from gmts_analysis.util.staging import staged_directory, swap_in  # noqa: F401 - re-exported
