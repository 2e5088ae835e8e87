"""What the sharded-collection tests share (tests/python/test_torchrec.py, test_torchrec_sequence.py,
test_torchrec_twrw.py): a model sharded by TorchRec's DistributedModelParallel with a per-table plan, and the
local shards of a collection read back with their optimizer state."""
import multiprocess


def shard(model, attr, sharder, per_param, rank, world, local_size=None):
    """DistributedModelParallel of `model` whose collection `model.<attr>` is sharded by `sharder` with the
    plan `per_param` (table name -> a torchrec.distributed.sharding_plan entry, or a ParameterSharding made by
    hand), on this rank's device; `local_size`: the processes of a node the plan is made for (the world
    where None: one node)."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ParameterSharding, ShardingEnv, ShardingPlan

    dev = multiprocess.device(rank)
    generators = {n: (lambda *_, made=p: made) if isinstance(p, ParameterSharding) else p for n, p in per_param.items()}
    module_plan = construct_module_sharding_plan(getattr(model, attr), per_param_sharding=generators,
                                                 local_size=world if local_size is None else local_size,
                                                 world_size=world, device_type=dev.type, sharder=sharder)
    return DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=dev,
                                    plan=ShardingPlan({attr: module_plan}), sharders=[sharder])


def local_shards(collection):
    """(table, (first row, first column), weights, optimizer state) of every local shard of a sharded
    collection."""
    shards = []
    for kernel in collection._embscale_kernels():
        state = kernel.tbe.optimizer_state()
        for t, w, s in zip(kernel.config.embedding_tables, kernel.tbe.split_embedding_weights(), state):
            md = t.local_metadata
            offset = (0, 0) if md is None else tuple(md.shard_offsets)
            shards.append((t.name, offset, w.detach().clone(), {k: v.clone() for k, v in s.items()}))
    return shards
