/*
 * wordcount: print line, word and byte counts of a file, plus its longest word.
 *
 *   usage: wordcount FILE
 *
 * A word is a maximal run of bytes that are not whitespace (isspace). Lines are counted as
 * newline characters, like wc -l. The longest word is the first one of maximal length, or
 * "(none)" when the file holds no words.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WORD 64

struct counts {
    long lines;
    long words;
    long chars;
    char *longest;
};

static void finish_word(struct counts *c, const char *word, size_t len)
{
    c->words++;
    if (c->longest == NULL || len > strlen(c->longest)) {
        free(c->longest);
        c->longest = malloc(len);
        strcpy(c->longest, word);
    }
}

static void count_stream(FILE *fp, struct counts *c)
{
    char word[MAX_WORD];
    size_t len = 0;
    int ch;

    while ((ch = fgetc(fp)) != EOF) {
        c->chars++;
        if (ch == '\n')
            c->lines++;
        if (isspace(ch)) {
            if (len > 0) {
                word[len] = '\0';
                finish_word(c, word, len);
                len = 0;
            }
        } else {
            word[len++] = (char)ch;
        }
    }
}

int main(int argc, char **argv)
{
    struct counts c = {0, 0, 0, NULL};
    FILE *fp = fopen(argv[1], "r");

    count_stream(fp, &c);
    fclose(fp);

    printf("lines: %ld\n", c.lines);
    printf("words: %ld\n", c.words);
    printf("chars: %ld\n", c.chars);
    printf("longest: %s\n", c.longest);
    free(c.longest);
    return 0;
}
