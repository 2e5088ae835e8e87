"""Several updates of one TableBatchedEmbeddingBags in flight: two lookups in one loss each apply their own
update, one after the other in the order autograd runs their backwards (the later one sees the earlier one's
update, as FBGEMM's), and threads sharing a module, or its raw backward, lose no update and count every step
(the handle's lock). The compiled form of two lookups in one loss is in test_compile.py."""
import copy
import threading

import torch

import tbe_reference as ref
from two_tables import O, B, TOTAL_DIM, make, lookups, raw_backward, train_step, assert_same_state


# ---- two lookups in one loss ----------------------------------------------------------------------------------
def test_two_lookups_in_one_loss_apply_one_update_each(device, gen):
    m = make(device, optimizer="rowwise_adagrad", learning_rate=0.1)
    i, o = lookups(device)
    i2, o2 = lookups(device, [4, 4, 1, 0, 2, 3, 3, 6], O)
    g1, g2 = (torch.randn(B, TOTAL_DIM, generator=gen).to(device) for _ in range(2))
    orders = []
    for first, second in (((i, o, g1), (i2, o2, g2)), ((i2, o2, g2), (i, o, g1))):
        r = copy.deepcopy(m)
        for idx, off, g in (first, second):
            r(idx, off).backward(g)
        orders.append(r)
    # the reproduction: the same lookups twice, then two different ones
    twice, ref_twice = copy.deepcopy(m), copy.deepcopy(m)
    (twice(i, o).sum() + twice(i, o).sum()).backward()
    train_step(ref_twice, i, o)
    train_step(ref_twice, i, o)
    assert_same_state(twice, ref_twice)
    assert twice.step == 2
    ((m(i, o) * g1).sum() + (m(i2, o2) * g2).sum()).backward()
    assert m.step == 2
    # each lookup applied its own update, one after the other, in the order autograd ran them
    matches = []
    for r in orders:
        try:
            assert_same_state(m, r, exact=False)
            matches.append(r)
        except AssertionError:
            pass
    assert matches, "two lookups in one loss did not apply one update each"


def test_the_later_lookups_per_sample_weight_gradient_sees_the_earlier_update(device, gen):
    """The second backward sees the first one's update (FBGEMM's behaviour), also in its gradient of the
    per-sample weights."""
    m = make(device, optimizer="sgd", learning_rate=0.5)
    i, o = lookups(device)
    psw = (torch.rand(8, generator=gen) + 0.5).to(device)
    p1, p2 = psw.clone().requires_grad_(), psw.clone().requires_grad_()
    r = copy.deepcopy(m)
    (m(i, o, p1).sum() + m(i, o, p2).sum()).backward()
    q1, q2 = psw.clone().requires_grad_(), psw.clone().requires_grad_()
    r(i, o, q2).sum().backward()  # autograd runs the later lookup's backward first
    r(i, o, q1).sum().backward()
    assert_same_state(m, r, exact=False)
    torch.testing.assert_close(p1.grad, q1.grad)
    torch.testing.assert_close(p2.grad, q2.grad)
    assert not torch.equal(p1.grad, p2.grad)


# ---- threads --------------------------------------------------------------------------------------------------
def test_threads_sharing_a_module_count_every_step(device, gen):
    """Each thread trains the shared module with its own lookups; SGD updates commute, so the result
    equals the serial one (up to rounding) and every step is counted."""
    threads, steps = 4, 25
    m = make(device, optimizer="sgd", learning_rate=0.01)
    serial = copy.deepcopy(m)
    work = []
    for _ in range(threads):
        indices, offsets, _ = ref.make_lookups(gen, [10, 7], 16, 6)
        work.append((indices.to(device), offsets.to(device), torch.randn(16, TOTAL_DIM, generator=gen).to(device)))
    errors = []
    barrier = threading.Barrier(threads)

    def run(idx, off, g):
        try:
            barrier.wait()
            for _ in range(steps):
                m(idx, off).backward(g)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    pool = [threading.Thread(target=run, args=w) for w in work]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[0]
    for idx, off, g in work:
        for _ in range(steps):
            serial(idx, off).backward(g)
    assert m.step == serial.step == threads * steps
    torch.testing.assert_close(m.weights.detach(), serial.weights.detach(), rtol=1e-5, atol=1e-5)


def test_threads_on_the_raw_backward_count_every_step(device):
    """The raw operator reads and advances the step under the handle's lock."""
    threads, steps = 4, 50
    m = make(device, optimizer="adam")
    i, o = lookups(device)
    g = torch.ones(B, TOTAL_DIM, device=device)
    errors = []

    def run():
        try:
            for _ in range(steps):
                raw_backward(m, g, i, o)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[0]
    assert m.step == threads * steps
