#include <stdio.h>
#include <string.h>

/* Count the brackets of a line: ( and [ open, ) and ] close. */
static int depth(const char *line) {
    int d = 0;
    for (size_t i = 0; i < strlen(line); i++) {
        char c = line[i];
        if (c == '(' || c == '[') d++;
        else if (c == ')' || c == ']') d--;
    }
    return d;
}

#define SQUARE(x) ((x) * (x))

int main(int argc, char **argv) {
    const char *text = "a string with { and \" and (";
    printf("%d %d\n", depth(argc > 1 ? argv[1] : text), SQUARE(3)); // a comment with }
    return 0;
}
