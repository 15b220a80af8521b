/* Byte counts as people read them: "512 B", "1.50 KiB", "14.12 GiB" (powers
 * of 1024, two decimals above bytes). Shared by the command line's tables
 * and the messages of the layers below it; every memory figure a person
 * reads is in these binary units, as device memories are sized. */
#ifndef PS_CORE_BYTES_TEXT_H
#define PS_CORE_BYTES_TEXT_H

/* Bytes in one GiB (2^30). */
#define PS_GIB 1073741824.0

/* Writes into buf (cap bytes) and returns it. */
const char *ps_bytes_text(double bytes, char *buf, int cap);

/* The unit a column of byte counts is shown in: the largest of B, KiB,
 * MiB, GiB, TiB, PiB that is not above max_bytes (B below 1 KiB, for 0 and
 * for what is not a finite positive number). */
typedef struct ps_bytes_unit {
    const char *name;
    double bytes; /* bytes per unit */
} ps_bytes_unit;
ps_bytes_unit ps_bytes_unit_for(double max_bytes);

#endif
