"""The cost figure's billing units (bench/cost_meter.py) follow DynamoDB's documented rules: item sizes
("Item sizes and formats": names and values, numbers a byte per two significant digits plus one), a
write billed per 1 KB of the larger of the item before and after it, the sparse GSI written when an
item enters, leaves, moves in it or changes a projected attribute, reads per 4 KB (half for eventually
consistent ones), a failed condition billed as its write without an index write."""

from __future__ import annotations

from bench.cost_meter import attribute_size, item_size, read_units, write_units


def test_sizes_count_names_and_values_as_dynamodb_does() -> None:
    assert attribute_size("kind", {"S": "video"}) == 4 + 5
    assert attribute_size("név", {"S": "é"}) == 4 + 2  # UTF-8 bytes, names too
    assert attribute_size("n", {"N": "123456"}) == 1 + 3 + 1  # 6 significant digits: 3 bytes, plus 1
    assert attribute_size("n", {"N": "1000"}) == 1 + 1 + 1  # trailing zeros are not significant
    assert attribute_size("b", {"BOOL": True}) == 2 and attribute_size("z", {"NULL": True}) == 2
    assert attribute_size("m", {"M": {"l": {"N": "1"}}}) == 1 + 3 + 1 + 1 + 1 + 1  # map: 3, each element 1 + its size
    assert item_size({"job_id": {"S": "job_1"}, "kind": {"S": "image"}}) == 11 + 9


def test_a_write_is_billed_per_kilobyte_of_the_larger_item_and_its_index_entries() -> None:
    small = {"job_id": {"S": "job_1"}, "pending_shard": {"S": "p01"}, "kind": {"S": "image"}}
    big = {**small, "result_json": {"S": "x" * 1500}}  # not projected into the index
    assert write_units(None, small) == (1.0, 1.0)  # a new pending record: the table and the index
    assert write_units(small, big) == (2.0, 0.0)  # 1.5 KB: two units; nothing projected changed
    assert write_units(big, small) == (2.0, 0.0)  # the larger of before and after
    moved = {**small, "pending_shard": {"S": "o01"}}
    assert write_units(small, moved) == (1.0, 2.0)  # its index key changed: a delete and a put
    done = {k: v for k, v in small.items() if k != "pending_shard"}
    assert write_units(small, done) == (1.0, 1.0)  # out of the sparse index: its delete
    projected = {**small, "kind": {"S": "video"}}
    assert write_units(small, projected) == (1.0, 1.0)  # a projected attribute changed: one index write
    assert write_units(big, big, failed=True) == (2.0, 0.0)  # a failed condition: its write, no index write
    assert write_units(None, small, transactional=True) == (2.0, 2.0)


def test_reads_are_billed_per_four_kilobytes_half_when_eventually_consistent() -> None:
    assert read_units(100, consistent=True) == 1.0 and read_units(100, consistent=False) == 0.5
    assert read_units(5000, consistent=True) == 2.0  # 5,000 bytes: two 4 KB units
    assert read_units(0, consistent=False) == 0.5  # an empty page still costs a unit
