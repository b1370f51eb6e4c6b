"""The verl recipe on verl 0.9.1's own extension points (this module imports verl; :mod:`.verl_recipe` does not).

**V1 trainer** (``trainer.use_v1=true``, verl 0.9.1's default). verl picks the trainer class by name from
its registry (``verl.trainer.ppo.v1.register_trainer``, ``trainer.v1.trainer_mode``). This module
registers ``gmts_sync``: verl's ``PPOTrainerSync`` whose ``_compute_advantage`` runs verl's own (KL in
reward, rollout correction, GRPO/GAE, ...), then reads ``entropy`` (the old-policy entropies that
``_compute_old_log_prob`` stores), ``advantages``, ``response_mask``, ``old_log_probs``, ``uid`` (and
``ref_log_prob`` with the KL loss) back from the TransferQueue, selects with
:func:`~gmts_analysis.integrations.verl_recipe.apply_token_selection` under the actor config, and writes
the masked advantages back. The actor update then trains on them with any vanilla policy loss.

The registry lives in the Ray process that runs verl's ``TaskRunnerV1``, so the registration has to
happen there: :class:`GmtsTaskRunner` (verl's ``TaskRunnerV1``, handed to verl's ``run_ppo`` through its
``task_runner_class`` argument, "for recipe to change TaskRunner") is defined here, and Ray imports this
module in that process. Run it as verl's ``main_ppo`` with the same hydra overrides::

    python -m gmts_analysis.integrations.verl_trainer <verl overrides> \\
        +gmts.selection=gmts +gmts.rho=0.2 +gmts.scope=group +gmts.normalizer=all

(``trainer.v1.trainer_mode`` ``sync`` becomes ``gmts_sync``; the ``gmts`` keys and their defaults are
:data:`GMTS_DEFAULTS`.) Another V1 mode: ``register_trainer("gmts_mine")(type("X", (GmtsSelection,
MyTrainer), {}))`` in a module that task runner imports.

**Legacy** ``RayPPOTrainer`` (``trainer.use_v1=false``; verl marks it deprecated): :class:`GmtsRayPPOTrainer`
keeps the entropies ``fit`` would drop (``_compute_old_log_prob`` returns them a second time as
``old_entropys``, which ``fit`` unions into the batch) and selects in ``_update_actor``, which ``fit``
calls after ``compute_advantage``. Construct it where verl's ``main_ppo_v0.TaskRunner`` constructs
``RayPPOTrainer`` (this module's entry point does so with ``trainer.use_v1=false``).

``seq-mean-token-sum-norm``: the V1 trainer keeps answers unpadded, so verl divides each micro-batch by
its own longest answer unless ``actor_rollout_ref.actor.loss_scale_factor`` is set; ``gmts_sync`` refuses
that mode without it (core/objective.py ``verl_loss_settings``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import ray
import transfer_queue as tq
import verl.trainer.main_ppo_v0 as _v0
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from gmts_analysis.core.objective import VERL_LOSS_AGG
from gmts_analysis.core.vocabulary import DEFAULT_RHO
from gmts_analysis.errors import GmtsError
from gmts_analysis.integrations.verl_recipe import apply_token_selection

#: the ``gmts`` config keys (``+gmts.<key>=...`` on verl's command line) and their defaults
GMTS_DEFAULTS: dict[str, Any] = {"selection": "gmts", "rho": DEFAULT_RHO, "scope": "group", "normalizer": "all",
                                 "seed": 0}


def gmts_options(config: Any) -> dict[str, Any]:
    """The selection keywords of verl's config (its ``gmts`` section over :data:`GMTS_DEFAULTS`); an unknown
    key is refused by name."""
    section = config["gmts"] if "gmts" in config else None  # hydra's struct mode: get() of a missing key raises
    given = dict(section or {})
    unknown = sorted(set(given) - set(GMTS_DEFAULTS))
    if unknown:
        raise GmtsError(f"gmts.{unknown[0]}: unknown key (choose from {', '.join(GMTS_DEFAULTS)})")
    return {**GMTS_DEFAULTS, **given}


def _check_horizon(actor: Any) -> None:
    if VERL_LOSS_AGG.get(actor.get("loss_agg_mode", "token-mean")) == "seq-mean-token-sum-norm" \
            and actor.get("loss_scale_factor") is None:
        raise GmtsError("actor_rollout_ref.actor.loss_scale_factor: verl's V1 trainer divides "
                        "seq-mean-token-sum-norm by each micro-batch's longest answer when it is unset; "
                        "set it (e.g. to rollout.response_length) for one horizon")


def _check_bypass(config: Any) -> None:
    rc = config.algorithm.get("rollout_correction", None)
    if rc is not None and rc.get("bypass_mode", False):
        raise GmtsError("algorithm.rollout_correction.bypass_mode: verl then computes no old-policy entropies "
                        "(it reuses the rollout's log-probs), which the selection ranks by; set it to false")


def select_in_transfer_queue(batch: Any, config: Any, metrics: dict) -> Any:
    """Select the tokens of a V1 batch (``KVBatchMeta``) in the TransferQueue; returns verl's new batch meta.

    Reads the fields named in the module docstring (nested, one row per answer), pads them as verl's
    ``_compute_advantage`` does, applies :func:`apply_token_selection` and writes ``advantages`` back nested.
    """
    actor = config.actor_rollout_ref.actor
    _check_horizon(actor)
    _check_bypass(config)
    fields = ["entropy", "advantages", "response_mask", "old_log_probs", "uid"]
    if actor.get("use_kl_loss", False):
        fields.append("ref_log_prob")
    td = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    nested_mask = td["response_mask"]
    data = DataProto(batch=td.to_padded_tensor())
    data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)
    metrics.update(apply_token_selection(data, entropy_key="entropy", actor=actor, algorithm=config.algorithm,
                                         **gmts_options(config)))
    out = TensorDict({"advantages": response_to_nested(data.batch["advantages"], nested_mask)},
                     batch_size=len(batch))
    return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)


class GmtsSelection:
    """Mixin for a V1 ``PPOTrainer``: token selection right after verl's ``_compute_advantage``."""

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        batch = super()._compute_advantage(batch, metrics=metrics)
        return select_in_transfer_queue(batch, self.config, metrics)


@register_trainer("gmts_sync")
class GmtsPPOTrainerSync(GmtsSelection, PPOTrainerSync):
    """verl's synchronous V1 trainer with the token selection (``trainer.v1.trainer_mode=gmts_sync``)."""


class GmtsRayPPOTrainer(RayPPOTrainer):
    """verl's legacy ``RayPPOTrainer`` with the token selection (module docstring)."""

    def _compute_old_log_prob(self, batch: DataProto):
        old_log_prob, mfu = super()._compute_old_log_prob(batch)
        old_log_prob.batch["old_entropys"] = old_log_prob.batch["entropys"].clone()  # fit pops "entropys"
        return old_log_prob, mfu

    def _update_actor(self, batch: DataProto) -> DataProto:
        _check_bypass(self.config)
        gmts_metrics = apply_token_selection(batch, actor=self.config.actor_rollout_ref.actor,
                                             algorithm=self.config.algorithm, **gmts_options(self.config))
        out = super()._update_actor(batch)
        out.meta_info["metrics"].update(gmts_metrics)
        return out


class GmtsTaskRunnerCls(TaskRunnerV1.__ray_actor_class__):
    """verl's ``TaskRunnerV1``; this module is imported in its process, so ``gmts_sync`` is registered there."""

    def run(self, config: Any) -> None:
        if config.trainer.v1.trainer_mode == "sync":
            config.trainer.v1.trainer_mode = "gmts_sync"
        return super().run(config)


class GmtsTaskRunnerV0Cls(_v0.TaskRunner.__ray_actor_class__):
    """verl's legacy ``TaskRunner`` constructing :class:`GmtsRayPPOTrainer` (``trainer.use_v1=false``)."""

    def run(self, config: Any) -> None:
        _v0.RayPPOTrainer = GmtsRayPPOTrainer  # the name TaskRunner.run constructs, rebound in this process only
        return super().run(config)


GmtsTaskRunner = ray.remote(GmtsTaskRunnerCls)
GmtsTaskRunnerV0 = ray.remote(GmtsTaskRunnerV0Cls)


def main() -> None:
    """``python -m gmts_analysis.integrations.verl_trainer`` with verl's hydra overrides (module docstring)."""
    import hydra
    import verl.trainer.main_ppo as main_ppo

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")

    @hydra.main(config_path=config_dir, config_name="ppo_trainer", version_base=None)
    def _main(config: Any) -> None:
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config
        from verl.utils.device import auto_set_device

        auto_set_device(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
        gmts_options(config)
        main_ppo.run_ppo(config, task_runner_class=GmtsTaskRunner if config.trainer.use_v1 else GmtsTaskRunnerV0)

    _main()


if __name__ == "__main__":
    main()
