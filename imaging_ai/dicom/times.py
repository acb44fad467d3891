"""Takes DICOM dates and times (DA, TM, TimezoneOffsetFromUTC) and a site's zone; gives aware times.

DICOM writes local time without a zone unless the data set carries Timezone Offset From UTC
(0008,0201), which then applies to every date and time in it (PS3.3 C.12.1.1.8). Without one
the time is the scanner's wall clock, which is the hospital's: ``[site] time_zone`` says which
zone that is, so a result made in a UTC container still says when the patient was scanned.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone, tzinfo
from functools import cache
from zoneinfo import ZoneInfo

_OFFSET = re.compile(r"([+-])(\d\d)(\d\d)")


@cache
def site_zone(name: str) -> tzinfo | None:
    """The zone of an IANA name; None for "" (the host's local zone, as ``astimezone()``
    reads it: with the host's daylight saving rules for each date)."""
    return ZoneInfo(name) if name else None


def utc_offset(text: str) -> timezone | None:
    """Timezone Offset From UTC (``+HHMM`` or ``-HHMM``) as a zone; None if absent or not
    of that form (the site's zone is used then)."""
    found = _OFFSET.fullmatch(text.strip())
    if found is None:
        return None
    sign, hours, minutes = found.groups()
    offset = timedelta(hours=int(hours), minutes=int(minutes))
    if offset > timedelta(hours=14) or int(minutes) >= 60:
        return None
    return timezone(-offset if sign == "-" else offset)


def in_zone(naive: datetime, offset: str, zone_name: str) -> datetime:
    """A zone-less DICOM time made aware: the data set's own offset if it has one, else the
    site's zone."""
    own = utc_offset(offset)
    if own is not None:
        return naive.replace(tzinfo=own)
    zone = site_zone(zone_name)
    return naive.replace(tzinfo=zone) if zone is not None else naive.astimezone()


def local(when: datetime, zone_name: str) -> datetime:
    """An aware time as the site's clock shows it (the host's for "")."""
    return when.astimezone(site_zone(zone_name))


def dicom_datetime(
    da: str, tm: str, offset: str = "", zone_name: str = ""
) -> datetime | date | None:
    """A DA and a TM as one aware time; the date alone where the time is empty or invalid
    (no midnight is claimed), None without a valid date."""
    try:
        day = datetime.strptime(da, "%Y%m%d")
    except ValueError:
        return None
    if not tm:
        return day.date()
    clock = (tm.split(".")[0] + "000000")[:6]
    try:
        naive = datetime.strptime(da + clock, "%Y%m%d%H%M%S")
    except ValueError:
        return day.date()
    return in_zone(naive, offset, zone_name)
