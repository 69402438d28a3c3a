"""TensorBoard oracle for paraflow's event-file writer (tests/data/tf_interop_test.cc).

    python tf_events.py LOGDIR

Loads LOGDIR with the `tensorboard` package's own readers and prints JSON to stdout:
  {"files": [names TensorBoard takes for event files],
   "file_version": the first event's file_version (event_file_loader),
   "scalars":    {tag: [[step, value, wall_time], ...]},        (EventAccumulator.Scalars)
   "histograms": {tag: [[step, min, max, num, sum, sum_squares, [limits], [counts]], ...]},
   "texts":      {tag: [[step, text], ...]},                    (Tensors with plugin "text")
   "plugins":    {plugin: [tags]}}
Exit status 0 on success, 1 on any error (reason on stderr).
"""
import json
import os
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader, io_wrapper
from tensorboard.util import tensor_util


def main():
    logdir = sys.argv[1]
    files = sorted(f for f in os.listdir(logdir) if io_wrapper.IsSummaryEventsFile(os.path.join(logdir, f)))
    if len(files) != 1:
        raise ValueError(f"expected one event file in {logdir}, found {files}")
    first = next(iter(event_file_loader.EventFileLoader(os.path.join(logdir, files[0])).Load()))
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={k: 0 for k in event_accumulator.DEFAULT_SIZE_GUIDANCE})
    acc.Reload()
    tags = acc.Tags()
    out = {"files": files, "file_version": first.file_version, "scalars": {}, "histograms": {}, "texts": {},
           "plugins": {}}
    for tag in tags["scalars"]:
        out["scalars"][tag] = [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)]
    for tag in tags["histograms"]:
        out["histograms"][tag] = [[e.step, h.min, h.max, h.num, h.sum, h.sum_squares, list(h.bucket_limit),
                                   list(h.bucket)] for e in acc.Histograms(tag) for h in [e.histogram_value]]
    plugins = sorted(acc._plugin_to_tag_to_content)  # no public list of plugins seen
    text_tags = sorted(acc.PluginTagToContent("text")) if "text" in plugins else []
    for tag in text_tags:
        out["texts"][tag] = [[e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode("utf-8")]
                             for e in acc.Tensors(tag)]
    for plugin in plugins:
        out["plugins"][plugin] = sorted(acc.PluginTagToContent(plugin).keys())
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001
        print(f"tf_events.py: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
