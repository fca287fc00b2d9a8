/*
 * The hit-rate plot of `kvoffload replay --plot`: hit rate (y, 0..1) against
 * capacity (x), one line with markers per curve (policies, or a fleet's
 * routings against the shared tier's capacity), references dashed,
 * a legend box, ticks and grid.  Drawn with cairo (Debian libcairo2-dev) when
 * the build found it (KVO_HAVE_CAIRO); otherwise rp_plot_png says so.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "replay.h"

#if KVO_HAVE_CAIRO
#include <cairo.h>

enum { RP_W = 960, RP_H = 600, RP_L = 80, RP_R = 200, RP_T = 50, RP_B = 70 };

static const double rp_colors[][3] = {
    {0.12, 0.47, 0.71}, {1.00, 0.50, 0.05}, {0.17, 0.63, 0.17}, {0.84, 0.15, 0.16},
    {0.58, 0.40, 0.74}, {0.55, 0.34, 0.29}, {0.89, 0.47, 0.76}, {0.50, 0.50, 0.50},
};

static double rp_nice_step(double span, int ticks) {
    double raw = span / ticks, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

static void rp_text(cairo_t *cr, double x, double y, const char *s, double ax, double ay) {
    cairo_text_extents_t te;
    cairo_text_extents(cr, s, &te);
    cairo_move_to(cr, x - te.width * ax - te.x_bearing, y - te.height * ay - te.y_bearing);
    cairo_show_text(cr, s);
}

static void rp_axes(cairo_t *cr, double x0, double x1, double step, double ymax, const char *title,
                    const char *xlabel) {
    const double pw = RP_W - RP_L - RP_R, ph = RP_H - RP_T - RP_B;
    char buf[64];
    cairo_set_font_size(cr, 12);
    cairo_set_line_width(cr, 1);
    int ny = (int)(ymax * 20 + 0.5); /* y grid every 0.05 */
    for (int i = 0; i <= ny; i++) {
        double y = RP_T + ph - ph * (i * 0.05) / ymax;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        cairo_move_to(cr, RP_L, y);
        cairo_line_to(cr, RP_L + pw, y);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        snprintf(buf, sizeof buf, "%.2f", i * 0.05);
        rp_text(cr, RP_L - 8, y, buf, 1, 0.5);
    }
    for (double v = ceil(x0 / step) * step; v <= x1 + step * 1e-9; v += step) {
        double x = RP_L + (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5) * pw;
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        cairo_move_to(cr, x, RP_T);
        cairo_line_to(cr, x, RP_T + ph);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        snprintf(buf, sizeof buf, "%.6g", v);
        rp_text(cr, x, RP_T + ph + 8, buf, 0.5, 0);
    }
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_rectangle(cr, RP_L, RP_T, pw, ph);
    cairo_stroke(cr);
    cairo_set_font_size(cr, 14);
    rp_text(cr, RP_L + pw / 2, RP_H - 20, xlabel, 0.5, 1);
    cairo_save(cr);
    cairo_translate(cr, 22, RP_T + ph / 2);
    cairo_rotate(cr, -M_PI / 2);
    rp_text(cr, 0, 0, "prefix hit rate (blocks hit / blocks requested)", 0.5, 0.5);
    cairo_restore(cr);
    cairo_set_font_size(cr, 16);
    rp_text(cr, RP_L + pw / 2, RP_T / 2, title, 0.5, 0.5);
}

int rp_plot_png(const char *path, const char *title, const char *xlabel, const double *xs, size_t nx,
                const rp_curve *curves, size_t ncurves, char *err, size_t errlen) {
    const double pw = RP_W - RP_L - RP_R, ph = RP_H - RP_T - RP_B;
    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, RP_W, RP_H);
    cairo_t *cr = cairo_create(sf);
    double x0 = xs[0], x1 = xs[0];
    for (size_t i = 1; i < nx; i++) {
        if (xs[i] < x0) x0 = xs[i];
        if (xs[i] > x1) x1 = xs[i];
    }
    double step = rp_nice_step(x1 > x0 ? x1 - x0 : (x0 > 0 ? x0 : 1), 8);
    if (x1 == x0) { x0 -= step; x1 += step; }
    double ymax = 0; /* the top of the y axis: the highest rate rounded up to 0.1, at most 1 */
    for (size_t c = 0; c < ncurves; c++)
        for (size_t i = 0; i < nx; i++)
            if (curves[c].hit_rate[i] > ymax) ymax = curves[c].hit_rate[i];
    ymax = ceil(ymax * 10 + 0.25) / 10;
    if (ymax > 1) ymax = 1;
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    rp_axes(cr, x0, x1, step, ymax, title, xlabel);
    cairo_set_font_size(cr, 13);
    for (size_t c = 0; c < ncurves; c++) {
        const double *col = rp_colors[c % (sizeof rp_colors / sizeof rp_colors[0])];
        int dashed = curves[c].dashed;
        cairo_set_source_rgb(cr, col[0], col[1], col[2]);
        cairo_set_line_width(cr, 2);
        double dash[] = {6, 4};
        cairo_set_dash(cr, dash, dashed ? 2 : 0, 0);
        for (size_t i = 0; i < nx; i++) {
            double x = RP_L + (xs[i] - x0) / (x1 - x0) * pw, y = RP_T + ph - curves[c].hit_rate[i] / ymax * ph;
            if (i) cairo_line_to(cr, x, y); else cairo_move_to(cr, x, y);
        }
        cairo_stroke(cr);
        cairo_set_dash(cr, dash, 0, 0);
        for (size_t i = 0; i < nx; i++) {
            double x = RP_L + (xs[i] - x0) / (x1 - x0) * pw, y = RP_T + ph - curves[c].hit_rate[i] / ymax * ph;
            cairo_arc(cr, x, y, 3.5, 0, 2 * M_PI);
            cairo_fill(cr);
        }
        double ly = RP_T + 20 + 24.0 * (double)c, lx = RP_W - RP_R + 20;
        cairo_set_dash(cr, dash, dashed ? 2 : 0, 0);
        cairo_move_to(cr, lx, ly);
        cairo_line_to(cr, lx + 30, ly);
        cairo_stroke(cr);
        cairo_set_dash(cr, dash, 0, 0);
        cairo_set_source_rgb(cr, 0, 0, 0);
        rp_text(cr, lx + 38, ly, curves[c].name, 0, 0.5);
    }
    cairo_destroy(cr);
    cairo_status_t st = cairo_surface_write_to_png(sf, path);
    cairo_surface_destroy(sf);
    if (st != CAIRO_STATUS_SUCCESS) {
        snprintf(err, errlen, "cannot write '%s': %s", path, cairo_status_to_string(st));
        return -1;
    }
    return 0;
}
#else
int rp_plot_png(const char *path, const char *title, const char *xlabel, const double *xs, size_t nx,
                const rp_curve *curves, size_t ncurves, char *err, size_t errlen) {
    (void)title; (void)xlabel; (void)xs; (void)nx; (void)curves; (void)ncurves;
    snprintf(err, errlen, "cannot draw '%s': this kvoffload was built without cairo "
             "(install libcairo2-dev, tools/setup-deps.sh, and rebuild)", path);
    return -1;
}
#endif
