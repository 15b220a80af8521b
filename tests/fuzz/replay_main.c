/* Runs a fuzz target over stored inputs, without libFuzzer: every file named
 * on the command line, and every regular file of every directory named. The
 * CTest tests fuzz_* run the corpus under tests/fuzz/corpus/ this way in
 * every build (and under the sanitizers in `make test-sanitize`). An input
 * whose file name starts with "valid-" must be accepted all the way
 * (fuzz_accepted), one named "bad-" must be refused; any other input (what
 * the fuzzer found, "regress-*") only must not crash or break a property. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Set by the target (the strong definition of fuzz_common.h's weak one). */
static int accepted;
void fuzz_accepted(void);
void fuzz_accepted(void)
{
    accepted = 1;
}

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return 1;
    }
    uint8_t *data = NULL;
    size_t size = 0, cap = 0;
    for (;;) {
        if (size == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *grown = realloc(data, cap);
            if (grown == NULL) {
                fprintf(stderr, "replay: %s: out of memory\n", path);
                free(data);
                fclose(f);
                return 1;
            }
            data = grown;
        }
        size_t n = fread(data + size, 1, cap - size, f);
        size += n;
        if (n == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "replay: %s: read error\n", path);
        free(data);
        return 1;
    }
    accepted = 0;
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    const char *base = strrchr(path, '/');
    base = base != NULL ? base + 1 : path;
    if (strncmp(base, "valid-", 6) == 0 && !accepted) {
        fprintf(stderr, "replay: %s: a valid input was refused (or not taken all the way)\n", path);
        return 1;
    }
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files of dir in name order, so that runs are alike. */
static int run_dir(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int failed = 0, listed = 1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(names, cap * sizeof *names);
            if (grown == NULL) {
                listed = 0;
                break;
            }
            names = grown;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        if ((names[n] = malloc(len)) == NULL) {
            listed = 0;
            break;
        }
        snprintf(names[n++], len, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    if (!listed) {
        fprintf(stderr, "replay: %s: out of memory listing the directory\n", dir);
        failed = 1;
    } else {
        qsort(names, n, sizeof *names, cmp_names);
    }
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (listed && stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            failed |= run_file(names[i]);
            (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return failed;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...  (runs the fuzz target on each input)\n", argv[0]);
        return 2;
    }
    int failed = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            failed = 1;
        } else if (S_ISDIR(st.st_mode)) {
            failed |= run_dir(argv[i], &count);
        } else {
            failed |= run_file(argv[i]);
            count++;
        }
    }
    if (count == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    printf("replay: %d inputs run\n", count);
    return failed;
}
