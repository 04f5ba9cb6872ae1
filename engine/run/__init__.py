"""Running a job: launching its ranks, recording its folder, controlling it from outside.

    file            what
    job.py          a training job: launch the ranks, relay their events, record the run
    recorder.py     run folders: what a run leaves on disk, written as it happens, readable for replay
    lineage.py      a resumed run's link to the runs it continues (History)
    throughput.py   tokens/s, defined once for every place that shows it
    control.py      stop, pause and resume a running job from outside it
    stop_signals.py SIGINT, SIGTERM, SIGHUP (a terminal's, a scheduler's) as a clean stop, a second one kills
    lock.py         whether a process is still writing into a run folder (an advisory lock)
    error_log.py    where full tracebacks go (a file the one-line message names)
    atomic_file.py  files written whole or not at all (temporary name, fsync, rename)
    printable.py    recorded text made safe to show on a terminal (control characters escaped)

Importing this package imports nothing, so a leaf such as atomic_file is cheap to reach.
"""
