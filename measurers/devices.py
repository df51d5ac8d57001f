"""The catalog's device profiles (measurers/catalog/devices.json): what a machine file or the local
machine names by model. Its own module so that the catalog and the local machine both read it."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

CATALOG_DIR = Path(__file__).with_name("catalog")
DEVICES_FILE = CATALOG_DIR / "devices.json"


@lru_cache(maxsize=1)
def device_profiles() -> dict[str, dict]:
    """Catalog device profiles keyed by model (each a dict of Device fields plus a ``source`` note)."""
    data = json.loads(DEVICES_FILE.read_text())
    return {model: profile for model, profile in data.items() if not model.startswith("_")}
