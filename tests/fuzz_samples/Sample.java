package org.example.orders;

import java.util.ArrayList;
import java.util.List;

/** Orders and their totals. */
public final class Sample {
    private final List<Integer> amounts = new ArrayList<>();

    public Sample add(int amount) {
        if (amount < 0) {
            throw new IllegalArgumentException("negative amount: (" + amount + "]");
        }
        amounts.add(amount);
        return this;
    }

    public int total() {
        char brace = '{';
        String block = """
            a text block with ( and {
            """;
        return amounts.stream().mapToInt(Integer::intValue).sum() + block.length() * 0 + (brace == '{' ? 0 : 1);
    }

    public static void main(String[] args) {
        System.out.println(new Sample().add(3).add(4).total()); // 7
    }
}
