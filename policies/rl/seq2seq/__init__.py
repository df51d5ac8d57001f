"""The 2017 seq2seq placer (Mirhoseini et al.): LSTM encoder over groups, attention decoder over devices."""
