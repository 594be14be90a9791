"""A labelled row whose prompt is blank is left out and counted, as one with a blank score (review
40): it was trained on as the empty prompt, its scores taught to the empty text's features."""

from __future__ import annotations

import pytest

from hybridllm import DataError
from hybridllm.router.dataset import load_routellm_csv


def test_rows_with_a_blank_prompt_are_left_out_and_counted(tmp_path) -> None:
    f = tmp_path / "labels.csv"
    f.write_text(
        "prompt,weak,strong\n"
        "What is 2+2?,True,True\n"
        ",False,True\n"
        "   ,True,False\n"
        "Prove Fermat's little theorem.,False,True\n"
        "Name a colour.,,True\n"
    )
    data = load_routellm_csv(f, weak_col="weak", strong_col="strong")
    assert data.prompts == ["What is 2+2?", "Prove Fermat's little theorem."]
    assert data.weak.tolist() == [1.0, 0.0] and data.strong.tolist() == [1.0, 1.0]
    assert data.skipped == 3  # two blank prompts, one blank score


def test_a_file_of_blank_prompts_only_is_still_refused(tmp_path) -> None:
    f = tmp_path / "labels.csv"
    f.write_text("prompt,weak,strong\n,True,False\n ,False,True\n")
    with pytest.raises(DataError, match="is empty"):
        load_routellm_csv(f, weak_col="weak", strong_col="strong")


def test_judged_rows_with_a_blank_prompt_are_left_out_too(tmp_path) -> None:
    f = tmp_path / "arena.csv"
    f.write_text(
        "prompt,model_a,model_b,winner\n"
        "Write a sonnet about rain.,gpt-4,mixtral,model_a\n"
        ",gpt-4,mixtral,model_b\n"
        "Explain TCP slow start.,mixtral,gpt-4,model_b\n"
    )
    data = load_routellm_csv(f, strong_models=["gpt-4"], weak_models=["mixtral"])
    assert data.prompts == ["Write a sonnet about rain.", "Explain TCP slow start."]
    assert len(data.weak) == len(data.strong) == 2
    assert data.skipped == 1
