# A Gantt chart of one iteration from a Chrome trace: one row per device,
# one bar per span, colored by category (compute, collective, send, recv,
# idle). Writes out.png and out.svg.
#
# `pipeshard plot --timeline T.json -o DIR` writes DIR/timeline.dat and runs
# this script; by hand:
#   gnuplot -e "data='DIR/timeline.dat'; out='DIR/timeline'; cats='compute send recv'; ndevices=8" timeline.gp
#
# Variables (pipeshard sets them all with -e):
#   data, out     the data file (block 0: row and device name, every k-th
#                 row beyond 100 devices; then one block
#                 per category in the order of cats: row start end) and the
#                 output path without extension
#   title         what ran: source, model and cluster
#   unit          unit of the start and end columns
#   cats          the categories present, in block order
#   ndevices      number of rows
#   tstart, tend  the window shown (the whole trace unless --from/--to)

if (!exists("data"))     data = 'timeline.dat'
if (!exists("out"))      out = 'timeline'
if (!exists("title"))    title = ''
if (!exists("unit"))     unit = 'ms'
if (!exists("cats"))     cats = 'compute collective send recv'
if (!exists("ndevices")) ndevices = 8

color(c) = c eq "compute" ? "#4477AA" : c eq "collective" ? "#EE6677" : \
           c eq "send" ? "#228833" : c eq "recv" ? "#CCBB44" : c eq "idle" ? "#DDDDDD" : "#AA3377"
half = 0.38   # half a row's height

h = ndevices * 30 + 220
h = h < 420 ? 420 : (h > 2400 ? 2400 : h)

set key outside top right horizontal samplen 2 width -2 font ",10"
set grid xtics lc rgb "#dddddd"
set xlabel sprintf("time since the first span (%s)", unit)
if (!exists("tstart")) tstart = 0
if (exists("tend")) { set xrange [tstart:tend] } else { set xrange [tstart:*] }
set yrange [ndevices - 0.5 : -0.5]      # the first device on top
set ytics nomirror scale 0 font ",10"
set xtics nomirror
set border 3
set style fill solid 1.0 noborder

do for [fmt in "png svg"] {
    if (fmt eq "png") {
        set terminal pngcairo size 1400,h enhanced font "DejaVu Sans,11"
    } else {
        set terminal svg size 1400,h enhanced font "DejaVu Sans,11" background rgb "white"
    }
    set output out.".".fmt
    set title "{/:Bold Timeline of one iteration}\n{/*0.85 ".title."}"
    # block 0 only names the rows (its points are NaN: nothing is drawn)
    plot data index 0 using (NaN):1:ytic(2) notitle, \
         for [i=1:words(cats)] data index i using 2:1:2:3:($1-half):($1+half) \
             with boxxyerror lc rgb color(word(cats, i)) title word(cats, i)
    set output
}
