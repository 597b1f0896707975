"""Issue 30: a message was cut mid-word ("... : FAIL : Only one of 'backe"): onnxruntime's causes sit after a
source-location prefix that used most of the 300 characters kept. errors.cause_line keeps the cause."""
from __future__ import annotations

from ctxbuild.errors import cause_line

# onnxruntime 1.32's text for provider options naming both a backend type and path (seen in a compile's log)
ORT = ("/onnxruntime_src/onnxruntime/core/session/plugin_ep/ep_plugin_provider_interfaces.cc:393 virtual "
       "std::unique_ptr<onnxruntime::IExecutionProvider> onnxruntime::PluginExecutionProviderFactory::CreateProvider"
       "(const OrtSessionOptions&, const OrtLogger&) [ONNXRuntimeError] : 1 : FAIL : Only one of 'backend_type' "
       "and 'backend_path' should be set.")


def test_onnxruntime_location_prefix_is_dropped() -> None:
    assert cause_line(RuntimeError(ORT)) == "Only one of 'backend_type' and 'backend_path' should be set."


def test_long_lines_end_at_a_word_with_an_ellipsis() -> None:
    text = "word " * 100
    line = cause_line(ValueError(text), limit=42)
    assert line.endswith(" ...") and len(line) <= 46
    assert all(w == "word" for w in line[:-4].split()), line


def test_first_or_last_line_and_empty_texts() -> None:
    e = RuntimeError("\n first \n\n middle\n last \n")
    assert cause_line(e) == "first" and cause_line(e, last=True) == "last"
    assert cause_line(KeyError()) == "KeyError"
    assert cause_line("") == "no output"
