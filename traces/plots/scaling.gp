# Scaling: throughput against the number of devices, one line per series,
# each with its ideal linear scaling from its smallest run (dashed). Writes
# out.png and out.svg.
#
# `pipeshard plot --scaling S.csv -o DIR` writes DIR/scaling.dat from the CSV
# (docs/compare.md describes its columns) and runs this script; by hand:
#   gnuplot -e "data='DIR/scaling.dat'; out='DIR/scaling'; nseries=2" scaling.gp
#
# Variables (pipeshard sets them all with -e):
#   data, out       the data file (one block per series: a title line, then
#                   devices throughput ideal) and the output path without extension
#   title           subtitle (the CSV's first comment and its name)
#   ylabel          the throughput column's name, e.g. "throughput (PFLOP/s)"
#   nseries         number of series (blocks)
#   xlog, xlo, xhi  devices axis: 1 for log2, and its range
#   ylog, ylo, yhi  throughput axis: 1 for log10, and its range

if (!exists("data"))    data = 'scaling.dat'
if (!exists("out"))     out = 'scaling'
if (!exists("title"))   title = ''
if (!exists("ylabel"))  ylabel = 'throughput'
if (!exists("nseries")) nseries = 1
if (!exists("xlog"))    xlog = 1
if (!exists("ylog"))    ylog = 0

array color[6] = ["#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377"]

set key top left box opaque samplen 3 spacing 1.2 font ",10"
set grid lc rgb "#dddddd"
set xlabel "devices"
set ylabel ylabel
if (xlog) { set logscale x 2 }
if (ylog) { set logscale y }
if (exists("xlo") && exists("xhi")) { set xrange [xlo:xhi] }
if (exists("ylo") && exists("yhi")) { set yrange [ylo:yhi] }
set format x "%g"
set key autotitle columnheader   # each block's first line is its series' name

do for [fmt in "png svg"] {
    if (fmt eq "png") {
        set terminal pngcairo size 1000,650 enhanced font "DejaVu Sans,11"
    } else {
        set terminal svg size 1000,650 enhanced font "DejaVu Sans,11" background rgb "white"
    }
    set output out.".".fmt
    set title "{/:Bold Throughput against devices}\n{/*0.85 ".title."}"
    plot for [i=0:nseries-1] data index i using 1:2 with linespoints lw 2 pt 7 ps 1.3 \
             lc rgb color[i%6+1] title columnheader(1), \
         for [i=0:nseries-1] data index i using 1:3 with lines dt 2 lw 1.2 \
             lc rgb color[i%6+1] notitle, \
         NaN with lines dt 2 lw 1.2 lc rgb "#555555" title "linear scaling"
    set output
}
