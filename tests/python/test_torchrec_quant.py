"""embscale.torchrec.QuantEmbeddingBagCollection against TorchRec's own quantized collection
(torchrec.quant.EmbeddingBagCollection, FBGEMM's CPU IntNBit TBE underneath) on the CPU: built from_float of the
same trained collection, they hold the same bytes under the same state_dict keys and give the same pooled
outputs; embscale's trained collection quantizes too; a TorchRec-quantized state_dict loads; bad input is
refused by name. Run by scripts/test_torchrec.sh (needs torchrec and fbgemm_gpu)."""

import copy
import io

import pytest
import torch

torchrec = pytest.importorskip("torchrec")
pytest.importorskip("fbgemm_gpu")

import torch.ao.quantization as tq  # noqa: E402
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType  # noqa: E402
from torchrec.modules.embedding_configs import DataType  # noqa: E402
from torchrec.quant.embedding_modules import EmbeddingBagCollection as TorchrecQuantEBC  # noqa: E402
from torchrec.quant.embedding_modules import QuantConfig  # noqa: E402

import embscale.torchrec as es_torchrec  # noqa: E402

QCONFIG_DTYPES = {"int8": torch.quint8, "int4": torch.quint4x2, "int2": torch.quint2x4}


def tables(pooling=PoolingType.SUM):
    return [EmbeddingBagConfig(name="t0", embedding_dim=16, num_embeddings=50, feature_names=["f0", "f1"],
                               pooling=pooling),
            EmbeddingBagConfig(name="t1", embedding_dim=64, num_embeddings=40, feature_names=["f2"], pooling=pooling),
            EmbeddingBagConfig(name="t2", embedding_dim=8, num_embeddings=30, feature_names=["f3"], pooling=pooling)]


def trained_ebc(seed, pooling=PoolingType.SUM, is_weighted=False):
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(tables=tables(pooling), is_weighted=is_weighted, device=torch.device("cpu"))
    with torch.no_grad():
        for bag in ebc.embedding_bags.values():
            bag.weight.normal_(0, 0.3).add_(torch.randn(bag.weight.shape[0], 1) * 0.2)
    return ebc


def batch(seed, is_weighted=False, keys=("f0", "f1", "f2", "f3"), batch_size=5):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 7, (len(keys) * batch_size,), generator=g)
    rows = {"f0": 50, "f1": 50, "f2": 40, "f3": 30}
    values = torch.cat([torch.randint(0, rows[k], (int(lengths[i * batch_size:(i + 1) * batch_size].sum()),),
                                      generator=g) for i, k in enumerate(keys)])
    weights = torch.rand(values.numel(), generator=g) if is_weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=list(keys), values=values, lengths=lengths, weights=weights)


def assert_close_pooled(got, want, magnitude):
    """Within a few fp32 ulps of each term: FBGEMM fuses q * scale + bias, embscale rounds twice."""
    assert got.keys() == want.keys()
    assert torch.all((got.values() - want.values()).abs() <= 32 * 2.0 ** -23 * magnitude + 1e-7)


@pytest.mark.parametrize("wtype", ["int8", "int4", "int2"])
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_from_float_holds_torchrecs_bytes_and_gives_its_outputs(wtype, pooling):
    seed = 4000 + len(wtype) + (pooling == PoolingType.MEAN)
    print("seed", seed)
    ebc = trained_ebc(seed, pooling)
    ebc.qconfig = QuantConfig(activation=tq.PlaceholderObserver.with_args(dtype=torch.float),
                              weight=tq.PlaceholderObserver.with_args(dtype=QCONFIG_DTYPES[wtype]))
    theirs = TorchrecQuantEBC.from_float(ebc)
    ours = es_torchrec.QuantEmbeddingBagCollection.from_float(ebc)
    assert [c.data_type for c in ours.embedding_bag_configs()] == [c.data_type for c in theirs.embedding_bag_configs()]
    their_state = {k: v for k, v in theirs.state_dict().items() if k.endswith(".weight")}
    our_state = ours.state_dict()
    assert sorted(our_state) == sorted(their_state)
    for key, value in their_state.items():
        value = getattr(value, "elem", value)  # (TorchRec's UInt4Tensor / UInt2Tensor wrap the rows' bytes)
        assert torch.equal(our_state[key], value), key  # the same quantized bytes, row for row
    kjt = batch(seed)
    magnitude = ebc(kjt).values().abs() + 1.0  # (the rows are O(1): a bound on each term's size)
    assert_close_pooled(ours(kjt), theirs(kjt), magnitude * 8)


def test_weighted_features_and_feature_order():
    seed = 4010
    print("seed", seed)
    ebc = trained_ebc(seed, is_weighted=True)
    ebc.qconfig = QuantConfig(activation=tq.PlaceholderObserver.with_args(dtype=torch.float),
                              weight=tq.PlaceholderObserver.with_args(dtype=torch.quint8))
    theirs = TorchrecQuantEBC.from_float(ebc)
    ours = es_torchrec.QuantEmbeddingBagCollection.from_float(ebc)
    kjt = batch(seed, is_weighted=True, keys=("f3", "f0", "f2", "f1"))  # another order than the tables'
    assert_close_pooled(ours(kjt), theirs(kjt), torch.full((5, 104), 16.0))


def test_embscale_collection_quantizes_and_a_torchrec_state_dict_loads():
    torch.manual_seed(4011)
    trained = es_torchrec.EmbeddingBagCollection(tables(), optimizer="sgd", learning_rate=0.1)
    q = es_torchrec.QuantEmbeddingBagCollection.from_float(trained, DataType.INT4)
    kjt = batch(4011)
    with torch.no_grad():
        dense = trained(kjt).values()
    assert torch.allclose(q(kjt).values(), dense, atol=0.1)
    # TorchRec's quantized collection of other tables' values: its state_dict loads into embscale's
    ebc = trained_ebc(4012)
    ebc.qconfig = QuantConfig(activation=tq.PlaceholderObserver.with_args(dtype=torch.float),
                              weight=tq.PlaceholderObserver.with_args(dtype=torch.quint4x2))
    theirs = TorchrecQuantEBC.from_float(ebc)
    q.load_state_dict({k: v for k, v in theirs.state_dict().items() if k.endswith(".weight")})
    assert_close_pooled(q(kjt), theirs(kjt), torch.full((5, 104), 16.0))
    # saved, loaded, copied: the same bytes and outputs
    buf = io.BytesIO()
    torch.save(q.state_dict(), buf)
    buf.seek(0)
    fresh = es_torchrec.QuantEmbeddingBagCollection(q.embedding_bag_configs())
    fresh.load_state_dict(torch.load(buf))
    clone = copy.deepcopy(q)
    for other in (fresh, clone):
        assert torch.equal(other(kjt).values(), q(kjt).values())
        assert other.embedding_bags["t1"].weight.data_ptr() == other.tbe.split_embedding_weights()[1].data_ptr()


def test_an_index_outside_its_table_warns_as_torchrecs_collection_does():
    """TorchRec's quantized collection runs FBGEMM's IntNBit TBE in its WARNING mode (it warns and goes on, and on
    CUDA never waits for the device): embscale's drop-in defaults to its own warn mode, which drops the index (FBGEMM
    maps it to row 0) and warns; bounds_check="error" raises at the call."""
    import embscale

    seed = 4015
    print("seed", seed)
    ebc = trained_ebc(seed)
    ebc.qconfig = QuantConfig(activation=tq.PlaceholderObserver.with_args(dtype=torch.float),
                              weight=tq.PlaceholderObserver.with_args(dtype=torch.quint8))
    theirs = TorchrecQuantEBC.from_float(ebc)
    ours = es_torchrec.QuantEmbeddingBagCollection.from_float(ebc)
    kjt = batch(seed)
    keys, lengths, values = kjt.keys(), kjt.lengths().clone(), kjt.values().clone()
    at = int(torch.nonzero(lengths)[0])  # the first non-empty bag; its first value becomes 1000
    first = int(lengths[:at].sum())
    bad_values = values.clone()
    bad_values[first] = 1000
    bad = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=bad_values, lengths=lengths)
    dropped_lengths = lengths.clone()
    dropped_lengths[at] -= 1
    dropped = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat([values[:first], values[first + 1:]]),
                                                  lengths=dropped_lengths)
    # TorchRec's goes on, its row 0 in the index's place (FBGEMM writes the 0 into the KJT's values: a copy here)
    theirs(KeyedJaggedTensor.from_lengths_sync(keys=keys, values=bad_values.clone(), lengths=lengths))
    with pytest.warns(embscale.BoundsCheckWarning, match="1 indices outside their tables were dropped"):
        got = ours(bad)
    assert torch.equal(got.values(), ours(dropped).values())
    strict = es_torchrec.QuantEmbeddingBagCollection.from_float(ebc, bounds_check="error")
    with pytest.raises(IndexError):
        strict(bad)


def test_bad_input_is_refused_by_name():
    bad = tables()
    bad[1] = EmbeddingBagConfig(name="t1", embedding_dim=64, num_embeddings=40, feature_names=["f2"],
                                data_type=DataType.UINT8)
    with pytest.raises(ValueError, match=r"tables\[1\].data_type"):
        es_torchrec.QuantEmbeddingBagCollection(bad)
    q = es_torchrec.QuantEmbeddingBagCollection(tables())
    with pytest.raises(ValueError, match="features: keys"):
        q(batch(4013, keys=("f0", "f1", "f2")))
    ebc = trained_ebc(4014)
    ebc.qconfig = QuantConfig(activation=tq.PlaceholderObserver.with_args(dtype=torch.float),
                              weight=tq.PlaceholderObserver.with_args(dtype=torch.int32))
    with pytest.raises(ValueError, match="qconfig"):
        es_torchrec.QuantEmbeddingBagCollection.from_float(ebc)
    with pytest.raises(ValueError, match="data_types"):
        es_torchrec.QuantEmbeddingBagCollection.from_float(ebc, [DataType.INT8])
