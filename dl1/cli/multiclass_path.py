"""``dl1 path`` on a store of more than two classes: the multinomial model along a grid of
penalties (:func:`dl1.path_multiclass`, each alpha certified and warm-started from the
previous one), its test accuracy per alpha, and the chosen model (the most accurate on the
test split, the first on ties, as the binary path chooses by its validation error) saved as
a :class:`dl1.models.MulticlassModel` for ``dl1 predict`` / ``dl1 score``.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np

import dl1
from dl1.cli.app import Output
from dl1.cli.multiclass import MULTINOMIAL, MulticlassChoice
from dl1.cli.progress import Progress
from dl1.cli.stores import where
from dl1.errors import ValidationError
from dl1.models import MulticlassModel
from dl1.multiclass_path import MulticlassPath
from dl1.store import Store


class PathOptions(NamedTuple):
    """The options of ``dl1 path`` a multiclass path takes."""

    n_alphas: int
    eps: float
    l1_ratio: float
    tol: float


def refuse_binary_only(store: Store, *, checkpoint: str | None, plots: str | None,
                       constrained: bool, saves: bool) -> None:  # fmt: skip
    """The options of the binary path a multiclass one has not, refused before a cluster
    starts; ``--output`` needs a test split (the saved model is the one it chooses)."""
    given = [name for name, on in (("--checkpoint", checkpoint is not None),
                                   ("--plots", plots is not None),
                                   ("--constrained", constrained)) if on]  # fmt: skip
    if given:
        raise ValidationError(f"{', '.join(given)}: not for a multiclass path (the multinomial "
                              "path has no checkpoints, figures or constrained form)")  # fmt: skip
    if saves and "test" not in store.splits:
        raise ValidationError(
            f"--output: {where(store)} has no test split, so the multiclass path chooses no "
            "model to save (it saves the most accurate on the test split); use dl1 fit --alpha"
        )


def models_of(res: MulticlassPath, choice: MulticlassChoice, l1_ratio: float,
              n_samples: int) -> list[MulticlassModel]:  # fmt: skip
    """Each alpha's fit as a :class:`MulticlassModel`."""
    return [MulticlassModel.from_result(f, alpha=float(a), l1_ratio=l1_ratio,
                                        penalty=choice.penalty, n_samples=n_samples)
            for a, f in zip(res.alphas_, res.fits_, strict=True)]  # fmt: skip


def accuracies_on_test(store: Store, models: list[MulticlassModel], client: Any) -> np.ndarray:
    """Each model's accuracy on the test split (the predictions computed together)."""
    preds = client.gather(client.compute([m.predict(store, split="test") for m in models]))
    y_test = store.read("y", "test")
    return np.array([float(np.mean(np.asarray(p) == y_test)) for p in preds])


def path_multiclass_and_report(store: Store, choice: MulticlassChoice, opts: PathOptions, *,
                               client: Any, out: Output) -> MulticlassModel | None:  # fmt: skip
    """Fit the multinomial path, print a line per alpha and fill the JSON result; returns
    the chosen model (None without a test split)."""
    t0 = time.perf_counter()
    with Progress("path") as progress:
        progress.note(f"multinomial path{' (grouped)' if choice.penalty == 'grouped' else ''}: "
                      f"{opts.n_alphas} alphas down to {opts.eps:g} x alpha_max")  # fmt: skip
        res = dl1.path_multiclass(store, n_alphas=opts.n_alphas, eps=opts.eps,
                                  l1_ratio=opts.l1_ratio, penalty=choice.penalty, tol=opts.tol,
                                  client=client)  # fmt: skip
    models = models_of(res, choice, opts.l1_ratio, store.shape("train")[0])
    accuracy = accuracies_on_test(store, models, client) if "test" in store.splits else None
    seconds = time.perf_counter() - t0
    best = None if accuracy is None else int(np.argmax(accuracy))
    nnz = [int(m.coef_.nnz) for m in models]
    for k, m in enumerate(models):
        acc = "" if accuracy is None else f"  test accuracy {accuracy[k]:.4f}"
        out.say(f"alpha {m.alpha:.4e}  nnz {nnz[k]:6d}  gap {m.gap_:.1e}  rounds "
                f"{m.n_rounds_:3d}{acc}{'  <- chosen' if k == best else ''}")  # fmt: skip
    out.say(f"multinomial path: {len(models)} alphas in {seconds:.2f} s, "
            f"{sum(m.converged_ for m in models)} certified at tol {opts.tol:g}")  # fmt: skip
    out.result.update(
        store=where(store), loss=MULTINOMIAL, multi_class="multinomial", penalty=choice.penalty,
        l1_ratio=opts.l1_ratio, tol=opts.tol, n_alphas=len(models), classes=res.classes_,
        alpha_max=res.alpha_max_, alphas=res.alphas_, n_nonzero=nnz, relative_gaps=res.gaps_,
        certified=[m.converged_ for m in models], n_rounds=res.n_rounds_, seconds=seconds,
        n_features_used=[int(np.unique(m.coef_.indices).shape[0]) for m in models],
        best_index=best, best_alpha=None if best is None else float(res.alphas_[best]),
    )  # fmt: skip
    if accuracy is not None:
        out.result["test_accuracy"] = accuracy
    return None if best is None else models[best]
