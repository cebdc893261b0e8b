"""openpilot routes on disk: reading (LogReader, segments, camera video by frame id) and writing (segments with rlog,
qlog and HEVC video). Importing the package pulls in only the log side; `oproute.video` needs PyAV."""
from oproute.logreader import LogReader, ReadMode, UnknownEvent, log_files, segment_dirs, segment_log

__all__ = ["LogReader", "ReadMode", "UnknownEvent", "log_files", "segment_dirs", "segment_log"]
