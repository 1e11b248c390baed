"""``make wheelhouse`` (deploy/gpu/wheelhouse.py): what a GPU host installs offline. Every pinned line is a
requirement; a line marked ``# build`` (DeepSpeed: an sdist only) is built here instead of downloaded."""

from __future__ import annotations

from deploy.gpu import wheelhouse


def test_requirements_are_the_pinned_lines_and_only_marked_ones_are_built_here():
    reqs = wheelhouse.requirements()
    assert "deepspeed==0.19.8" in reqs and "fastapi==0.128.0" in reqs
    assert all("#" not in r and r == r.strip() and "==" in r for r in reqs), reqs
    assert wheelhouse.built_here() == {"deepspeed==0.19.8"}


def test_the_deepspeed_pin_is_the_one_make_install_puts_beside_the_environment():
    from pathlib import Path

    makefile = (Path(wheelhouse.__file__).resolve().parents[2] / "Makefile").read_text()
    assert "DEEPSPEED_VERSION := 0.19.8" in makefile
