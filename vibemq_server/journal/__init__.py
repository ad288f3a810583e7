"""The durable journal: record codec (the on-disk contract) and the segment writer/recovery."""

from vibemq_server.journal.journal import FsyncPolicy, Journal
from vibemq_server.journal.records import JournalError, RecordType, encode_record, iter_records
from vibemq_server.journal.recovery import JournalCorrupt

__all__ = [
    "FsyncPolicy",
    "Journal",
    "JournalCorrupt",
    "JournalError",
    "RecordType",
    "encode_record",
    "iter_records",
]
