"""The check that a path is a model repository Triton could serve, made before a server claims to serve it, with
the build to run where it is not."""

from __future__ import annotations

from pathlib import Path


class RepositoryError(ValueError):
    """A path that is no model repository Triton could serve."""


def check_repository(repository: Path) -> list[str]:
    """The models a repository holds (folders with a config.pbtxt); refuses a path Triton would serve nothing
    from, before a server claims to serve it."""
    if not repository.exists():
        raise RepositoryError(f"{repository} does not exist: pass the folder `tritonforge build` wrote "
                              f"(its --output, model_repository by default)")
    if not repository.is_dir():
        raise RepositoryError(f"{repository} is not a folder: pass the folder `tritonforge build` wrote")
    models = sorted(child.name for child in repository.iterdir() if (child / "config.pbtxt").is_file())
    if models:
        return models
    if (repository / "config.json").is_file():
        output = _repository_beside(repository)
        raise RepositoryError(f"{repository} is a Hugging Face checkpoint, not a model repository: build one from it "
                              f"with `tritonforge build --model {repository} --output {output}`, then serve {output}")
    # The build writes only into an empty or new folder.
    output = repository if not any(repository.iterdir()) else _repository_beside(repository)
    raise RepositoryError(f"{repository} holds no model (no <model>/config.pbtxt): it is not a model repository; "
                          f"build one with `tritonforge build --model CHECKPOINT --output {output}`")


def _repository_beside(folder: Path) -> Path:
    """Where to build a repository for a folder that cannot hold one (a checkpoint, a folder of other files):
    the build's default folder, unless this one is, or holds, the working directory."""
    folder, cwd = folder.resolve(), Path.cwd().resolve()
    if cwd == folder or folder in cwd.parents:
        return folder.parent / f"{folder.name}-repository"
    return Path("model_repository")
