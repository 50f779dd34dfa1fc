"""The compile report says what its kernel count counts, so validate-only and full compiles agree."""
from __future__ import annotations

from examples.zoo import MODELS


def test_validate_and_compile_counts_differ_by_the_precision_casts_and_both_reports_say_so(zoo_estimator, tmp_path):
    est = zoo_estimator("mlp", compile_dir=str(tmp_path / "compile"))
    checked = est.compile(MODELS["mlp"].input_fn, validate_only=True)
    compiled = est.compile(MODELS["mlp"].input_fn)

    casts = compiled.kernel_counts["to_half"]
    before_casts = len(checked.program.kernels)
    assert casts > 0 and len(compiled.program.kernels) == before_casts + casts
    assert compiled.kernel_summary == f"{before_casts + casts} kernels ({before_casts} + {casts} precision casts)"
    assert checked.kernel_summary.startswith(f"{before_casts} kernels (validate only: a full compile adds the "
                                             "precision casts")
    assert f"Program: {compiled.kernel_summary}\n" in compiled.report
    assert f"Precision casts inserted: {casts} " in compiled.report
    assert f"Program: {checked.kernel_summary}\n" in checked.report
    assert "Precision casts inserted" not in checked.report  # none yet: the summary line says why
