import pytest

from rig.errors import InvalidInput
from rig.memory import GIB, MIB, MIN_SIZE, format_memory, parse_memory


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12G", 12 * GIB), ("12g", 12 * GIB), ("12GB", 12 * GIB), ("12GiB", 12 * GIB),
        ("512M", 512 * MIB), ("1.5G", int(1.5 * GIB)), (" 2 T ", 2 * 1024 * GIB), ("0.5g", GIB // 2),
        (4 * MIB, 4 * MIB), (float(GIB), GIB),
    ],
)
def test_parse_memory_accepts_common_spellings(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["12Q", "0", "0G", "-3G", "", "G", "12 GQ", "twelve", "1e3G", "12"])
def test_parse_memory_rejects_bad_sizes_with_one_line(text):
    with pytest.raises(InvalidInput) as err:
        parse_memory(text)
    message = str(err.value)
    assert "\n" not in message
    assert "--gpu-memory" in message


def test_parse_memory_rejects_nonpositive_numbers():
    with pytest.raises(InvalidInput):
        parse_memory(0)
    with pytest.raises(InvalidInput):
        parse_memory(-5)
    with pytest.raises(InvalidInput):
        parse_memory(True)


def test_an_infinite_number_is_refused_in_one_line():
    """float('inf') passed the > 0 check and ended in int(): OverflowError (a traceback from
    rig.submit / @rig.task), not the one line."""
    with pytest.raises(InvalidInput, match="is no number of bytes; give a size such as '12G'"):
        parse_memory(float("inf"))


@pytest.mark.parametrize("number", [4, 1.5, 4096, MIB - 1, GIB + 0.5, float("nan")])
def test_a_number_that_cannot_be_meant_as_bytes_is_refused(number):
    """Breaker: ``rig.submit(..., gpu_memory=4)`` (or 1.5) meant GiB, declared 4 bytes (or 1) and
    ran; the command line refuses a bare 4 ('has no unit')."""
    with pytest.raises(InvalidInput) as err:
        parse_memory(number)
    assert "\n" not in str(err.value)
    if number > 0:
        assert f"{number!r} is a number of bytes; give a whole number of at least 1048576 (1 MiB), or a size " \
               f"such as '{number:g}G'" in str(err.value)


def test_error_says_what_to_do():
    with pytest.raises(InvalidInput, match="use K, M, G or T"):
        parse_memory("12Q")
    with pytest.raises(InvalidInput, match="no unit"):
        parse_memory("12")


def test_format_memory():
    assert format_memory(12 * GIB) == "12.0 GiB"
    assert format_memory(512 * MIB) == "512 MiB"
    assert format_memory(None) == "-"
    assert format_memory(10) == "10 B"


@pytest.mark.parametrize("text", ["0", "-1", "0G", "0.0001K"])
def test_a_size_of_nothing_is_refused_with_advice_that_works(text):
    with pytest.raises(InvalidInput) as err:
        parse_memory(text)
    assert "write it like 12G" in str(err.value) and "0G" not in str(err.value).split("write it like")[1]


@pytest.mark.parametrize("text", ["0.0000001G", "1023K", "0.5M", " 1000 KiB "])
def test_a_typed_size_under_a_mib_is_refused_as_a_number_is(text):
    """`rig-submit -m 0.0000001G` stored a 107-byte job, while the number 107 was refused:
    one smallest size, MIN_SIZE, for text and numbers."""
    with pytest.raises(InvalidInput, match="less than 1 MiB"):
        parse_memory(text)
    with pytest.raises(InvalidInput, match="at least 1048576"):
        parse_memory(MIN_SIZE - 1)
    assert parse_memory("1M") == parse_memory(MIN_SIZE) == MIN_SIZE == MIB
