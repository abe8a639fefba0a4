wc -l < data/rows.csv
