DROP TABLE receipts;
