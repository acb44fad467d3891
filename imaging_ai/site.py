"""Takes the ``[site]`` configuration and the data directory; gives this installation's identity.

DeviceSerialNumber (0018,1000) names the device that made our SEG and SR, and the SR's Device
Observer UID is derived from it. The host name was used before; in a container it changes
with every new container, and each node of a shared installation has its own, so the same
installation showed up as ever new devices and a job re-run on another node gave objects that
differ from the first under the same UIDs. An identifier made once per installation and kept
in its data directory stays the same across restarts, upgrades and renamed hosts; nodes that
share the data directory share it. Nodes with data directories of their own set
``[site] device_serial_number`` to one value (the hospital's asset number, say).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from pathlib import Path

from imaging_ai.config import Config
from imaging_ai.durable import fsync_path

SERIAL_FILE = "device-serial-number"
# Manufacturer (0008,0070) of every SEG and SR we write: how our own earlier results are
# recognised when a PACS sends a whole study back (`imaging_ai.catalog.not_analysed`).
MANUFACTURER = "imaging-ai"


def with_device_serial_number(config: Config) -> Config:
    """``config`` with ``site.device_serial_number`` set: as configured, else the one kept in
    the data directory (made there, once, if it has none).

    Raises
    ------
    OSError
        The data directory cannot be read or written.
    """
    if config.site.device_serial_number:
        return config
    serial = stored_serial_number(Path(config.storage.data_dir))
    site = dataclasses.replace(config.site, device_serial_number=serial)
    return dataclasses.replace(config, site=site)


def stored_serial_number(data_dir: Path) -> str:
    """The serial number kept in ``data_dir``, made on first use.

    Made under a temporary name and linked into place, so two processes (or nodes on one
    shared directory) starting at once agree on the first one written.
    """
    path = data_dir / SERIAL_FILE
    with contextlib.suppress(FileNotFoundError):
        if serial := path.read_text(encoding="ascii").strip():
            return serial
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / f".{SERIAL_FILE}.{os.getpid()}.tmp"
    tmp.write_text(f"{uuid.uuid4()}\n", encoding="ascii")  # 36 characters: fits LO
    fsync_path(tmp)
    try:
        os.link(tmp, path)
        fsync_path(data_dir)
    except FileExistsError:
        pass  # another process made it first: its number is the installation's
    finally:
        tmp.unlink()
    return path.read_text(encoding="ascii").strip()
