DROP TABLE greetings;
