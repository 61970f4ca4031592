def mean(values):
    """The arithmetic mean of a non-empty list of numbers."""
    total = 0
    for value in values:
        total += value
    return <HOLE>


print(mean([1, 2, 3]))
