"""``polyad.recent.Recent``, the bounded memory of artifacts and dependence analyses."""

import threading

from polyad.recent import Recent


def test_the_least_recently_used_value_goes_first():
    recent = Recent(2)
    recent.keep("a", 1)
    recent.keep("b", 2)
    assert recent.get("a") == 1  # now "b" is the least recently used
    recent.keep("c", 3)
    assert recent.get("b") is None and recent.get("a") == 1 and len(recent) == 2
    recent.bound = 1
    recent.keep("d", 4)
    assert recent.items() == [("d", 4)]


def test_threads_making_one_key_at_once_share_the_first_value_kept():
    """``make`` runs outside the lock, so two threads may both make a value; both get
    the one kept first, as a kernel's artifact must be one object."""
    recent = Recent(4)
    both_making = threading.Barrier(2)
    got = [None, None]

    def ask(slot):
        def make():
            both_making.wait(timeout=10)
            return object()
        got[slot] = recent.get_or_make("key", make)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got[0] is got[1] is recent.get("key")


def test_replace_restores_what_was_remembered():
    recent = Recent(3)
    recent.keep("a", 1)
    before = recent.items()
    recent.clear()
    recent.keep("b", 2)
    recent.replace(before)
    assert recent.items() == [("a", 1)]
