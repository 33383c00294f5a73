"""`seqwarm export` prints its own line only: other libraries' notices are silenced while it runs."""

import logging
import warnings

import pytest

from seqwarm.cli.commands.export import quiet_other_libraries


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_other_libraries_print_errors_only_during_an_export():
    hf_logging = pytest.importorskip("transformers.utils.logging")
    kept = _Kept()
    deepspeed, ours = logging.getLogger("DeepSpeed"), logging.getLogger("seqwarm.evaluation.export")
    for logger in (deepspeed, ours):
        logger.addHandler(kept)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with quiet_other_libraries():
                deepspeed.warning("Setting accelerator to CPU.")
                deepspeed.error("a real DeepSpeed error")
                ours.warning("warning: seqwarm's own")
                warnings.warn_explicit("deprecated", FutureWarning, "x.py", 1, module="transformers.modeling_utils")
                warnings.warn_explicit("kept", UserWarning, "x.py", 1, module="seqwarm.evaluation.export")
                assert not hf_logging.is_progress_bar_enabled()
                assert hf_logging.get_verbosity() == logging.ERROR
            deepspeed.warning("after the export")
        assert kept.messages == ["a real DeepSpeed error", "warning: seqwarm's own", "after the export"]
        assert [str(w.message) for w in caught] == ["kept"]
        assert hf_logging.is_progress_bar_enabled()  # put back
    finally:
        for logger in (deepspeed, ours):
            logger.removeHandler(kept)
