"""bounds_check="warn": each call's BoundsCheckWarning reports that call's own count of dropped indices,
also when threads share a module (docs/python.md allows it)."""
import threading
import warnings

import torch

import embscale


def test_each_call_warns_of_its_own_count_when_threads_share_a_module(monkeypatch):
    # One thread drops 183 indices, the other none. Each call is held, in turn, between the library's
    # lookup and its warning while the other thread's whole call runs: the warning used to read the count
    # from the module's shared num_skipped buffer, which the other call had overwritten by then (the held
    # bad call warned of nothing, the held clean call of 183 drops).
    m = embscale.TableBatchedEmbeddingBags([(10, 4)], optimizer="sgd")
    calls = {"bad": (torch.full((183,), 10), torch.tensor([0, 183])),
             "clean": (torch.tensor([1, 2]), torch.tensor([0, 2]))}
    lookup = embscale.ops.tbe_forward_eager
    for held, other in (("bad", "clean"), ("clean", "bad")):
        looked_up, release = threading.Event(), threading.Event()

        def forward(*args, **kwargs):
            result = lookup(*args, **kwargs)
            if threading.current_thread().name == held:
                looked_up.set()
                release.wait(30)
            return result

        monkeypatch.setattr(embscale.ops, "tbe_forward_eager", forward)
        caught, errors = [], []

        def call(name):
            try:
                m(*calls[name])
            except BaseException as e:  # (reported by the test thread)
                errors.append(e)

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda message, *_args, **_kw: caught.append(
                (threading.current_thread().name, str(message)))
            first = threading.Thread(target=call, args=(held,), name=held)
            first.start()
            assert looked_up.wait(30)
            second = threading.Thread(target=call, args=(other,), name=other)
            second.start()
            second.join(30)
            release.set()
            first.join(30)
        assert not errors and not first.is_alive() and not second.is_alive()
        assert [name for name, _ in caught] == ["bad"], (held, caught)
        assert "183 indices outside their tables were dropped" in caught[0][1]
