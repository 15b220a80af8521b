/* Byte counts as people read them: "512 B", "1.50 KiB", "14.12 GiB" (powers
 * of 1024, two decimals above bytes). Shared by the command line's tables
 * and the messages of the layers below it. */
#ifndef PS_CORE_BYTES_TEXT_H
#define PS_CORE_BYTES_TEXT_H

/* Writes into buf (cap bytes) and returns it. */
const char *ps_bytes_text(double bytes, char *buf, int cap);

#endif
