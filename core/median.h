/* The median of a handful of measurements (repetitions, steps). */
#ifndef PS_CORE_MEDIAN_H
#define PS_CORE_MEDIAN_H

/* The median of v[0..n-1], which it sorts in place: the middle value, or the
 * mean of the two middle ones when n is even; 0 when n < 1. */
double ps_median(double *v, int n);

#endif
