DROP TABLE IF EXISTS fenceq_periodic_clock;
DROP TABLE IF EXISTS fenceq_periodic;
